"""One msrun worker of tests/test_distributed.py: rank 1 alone fails in the check the ranks decide together, with an
error that is no refusal of ms_accum's (a KeyError, as a file read without a wrapped error would raise).

    msrun --worker_num=2 --local_worker_num=2 --master_port=P --join=True refuse_worker.py

Every rank must end: rank 1 with its KeyError, rank 0 with the message naming rank 1; none waits in the all-reduce.
"""
from ms_accum.train.distributed import decided_together, init_data_parallel

parallel = init_data_parallel()


def check() -> str:
    if parallel.rank == 1:
        raise KeyError("'step' missing from the file read on rank 1")
    return "accepted"


decided_together(check, parallel, "the training state to resume from")
print("started", flush=True)  # no rank may get here
