"""Tutorial: evaluate a saved checkpoint on the MNIST test set, as the Cell-graph tutorial's last step.

The checkpoint records its model, so nothing else needs to be said; loading is strict (a checkpoint of
another model, a truncated file or a missing parameter is an error, never a half-loaded network).

    python tutorials/evaluate_checkpoint.py [--ckpt ckpt/gradient_accumulation.ckpt] [--data DIR]
"""
import argparse

import ms_accum  # first: importing ms_accum caps oneDNN's CPU ISA before MindSpore loads

from ms_accum.demo import evaluate_checkpoint  # noqa: E402

# Configuration
CKPT = "ckpt/gradient_accumulation.ckpt"
BATCH_SIZE = 256
DEVICE = "CPU"  # or "GPU", "Ascend"


def main(ckpt: str, data: str) -> float:
    ms_accum.set_device(DEVICE)
    evaluation, metadata = evaluate_checkpoint(ckpt, data=data, batch_size=BATCH_SIZE)
    print(f"{ckpt}: {metadata.get('model')} after {metadata.get('step')} optimizer steps "
          f"(K={metadata.get('accumulate_step', metadata.get('accumulate_steps'))})")  # 0.2 wrote accumulate_steps
    print(evaluation)
    return evaluation.accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", default=CKPT)
    parser.add_argument("--data", help="MNIST directory (default: the one the checkpoint was trained on)")
    args = parser.parse_args()
    main(args.ckpt, args.data)
