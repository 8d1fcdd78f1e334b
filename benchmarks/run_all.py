"""Run every ms_accum benchmark and write a report, the raw numbers and a plot of the ratios.

    .venv/bin/python benchmarks/run_all.py [--quick] [--out DIR] [--only a,b,c,d,e,f,profile] [--data DIR]

Sections (LeNet5, Momentum(0.01, 0.9), micro-batch 32, K = 4; contenders interleaved in rounds, warm-up
excluded, median ms and the ratio to a baseline):
  a  ms_accum's micro-step and executor loop vs nn.TrainOneStepCell (target <= 1.02)
  b  ms_accum vs the documentation's two implementations (the benchmark's own copies; target <= 1.02 each);
     b2 what each launch of the window's bookkeeping is worth (a tiny network, one choice changed per row);
     b3 b's two comparisons with three processes per contender (no graph's compilation moves another's speed)
  c  a window of 4 x b32 vs one b128 step (target <= 1.00), with TrainWindowCell (one call per window)
  d  vs the equivalent PyTorch CPU loop (target throughput >= 1.0x), and MindSpore thread settings
  e  the tutorial's epoch end to end (real MNIST pipeline) vs the step alone
  f  memory the accumulator adds, as a multiple of the parameters (Parameters counted; peak RSS per structure)
  m  activation memory: every structure's peak RSS over a dataset as a multiple of one micro-batch's step, for an
     activation-heavy conv net and the Shakespeare tutorial's transformer, K in {4, 8, 16} (one fresh process per
     figure)
  profile  where the time goes: MindSpore profiler, ONEDNN_VERBOSE=1, torch.profiler; max-pooling rewrites
  g  DIR/ratios.png; DIR/report.txt and DIR/results.json hold the tables.
--quick is a ~1-2 minute smoke run (few rounds, fewer contenders): a check that everything runs, not a measurement.
"""
import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ("a", "b", "c", "d", "e", "f", "m", "profile")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (few rounds)")
    parser.add_argument("--out", help="output directory (default benchmarks/results/full or .../quick)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections to run")
    parser.add_argument("--memory-repeats", type=int, default=3, metavar="N",
                        help="processes per figure in section m, whose median is shown (default 3; 1 with --quick)")
    parser.add_argument("--reverse-build", action="store_true",
                        help="section b builds (compiles) its contenders in the opposite order: run b both ways")
    parser.add_argument("--data", help="MNIST_Data directory (default $MS_ACCUM_MNIST or ../shared/data/MNIST_Data)")
    args = parser.parse_args(argv)
    args.only = set(args.only.split(","))
    unknown = args.only - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    args.out = args.out or os.path.join(REPO, "benchmarks", "results", "quick" if args.quick else "full")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, REPO)  # `benchmarks` and `ms_accum` from this checkout
    from ms_accum.runtime import prefer_fast_cpu_kernels
    prefer_fast_cpu_kernels()  # oneDNN reads its ISA cap when MindSpore loads: before any import of it

    from benchmarks import common, launches, memory, pipeline, plot, profile, steps, threads
    # rounds, micro-batches per round, windows per round, pipeline images per round, profiled micro-batches
    rounds, calls, windows, images, traced = (3, 8, 2, 1024, 8) if args.quick else (21, 32, 8, 6400, 64)
    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    report, tables, memory_rows, peak_rows, activation_rows = [common.header()], [], None, None, None

    def emit(text: str) -> None:
        print(text, flush=True)
        report.append(text)

    print(report[0], flush=True)
    common.setup_mindspore()
    data_dir = common.mnist_dir(args.data)
    batches = common.micro_batches(16, data_dir)
    shown = os.path.relpath(data_dir, REPO) if data_dir else 'random tensors (no MNIST found)'  # no machine's path
    emit(f"data    : {shown}; mode {'quick' if args.quick else 'full'}")

    def section(key, title, fn):
        if key not in args.only:
            return None
        common.log(f"-- {key}: {title} ({time.time() - started:.0f} s so far)")
        result = fn()
        for table in result if isinstance(result, list) else [result]:
            if isinstance(table, common.Table):
                tables.append(table)
                emit(table.render())
        return result

    section("a", "micro-step and executor loop", lambda: [steps.micro_step(batches, rounds, calls),
                                                           steps.executor_loop(batches * 2, max(3, rounds // 2))])
    # b: twice the rounds, for its 2 % targets; b2 times fixed costs on a tiny network, many windows per round; b3 is
    # b's two comparisons with one process per contender (longer blocks: a worker wakes from idle at each block)
    section("b", "documentation implementations", lambda: [steps.documentation(batches, 2 * rounds, calls,
                                                                                       args.reverse_build),
                                                           launches.launches(2 * rounds, 4 * windows),
                                                           steps.documentation_processes(2 * rounds, 2 * calls)])
    section("c", "window vs b128", lambda: steps.window(batches, rounds, windows)[0])
    # d: longer blocks, because each worker process wakes from idle at the start of its block
    section("d", "torch and thread settings", lambda: threads.torch_vs_mindspore(max(3, rounds * 3 // 4), 2 * calls,
                                                                                 args.quick))
    if data_dir is None and "e" in args.only:
        emit("== e. skipped: no MNIST directory (pass --data DIR or set MS_ACCUM_MNIST)")
    elif data_dir is not None:
        section("e", "end-to-end epoch", lambda: pipeline.epoch(data_dir, batches, max(3, rounds // 3), images,
                                                                args.quick))
    if "f" in args.only:
        memory_rows, trainable = memory.accumulator_memory()
        emit(memory.render(memory_rows, trainable))
        common.log(f"-- f2: peak resident memory, one process per structure ({time.time() - started:.0f} s so far)")
        peak_rows, peak_params = memory.peak_rss()
        emit(memory.render_peak(peak_rows, peak_params))
    if "m" in args.only:
        from benchmarks import activation_memory
        common.log(f"-- m: activation memory, one process per figure ({time.time() - started:.0f} s so far)")
        activation_rows = activation_memory.table(ks=(4,) if args.quick else (4, 8, 16),
                                                  repeats=1 if args.quick else args.memory_repeats, log=common.log)
        emit(activation_memory.render(activation_rows))
    if "profile" in args.only:
        common.log(f"-- profile ({time.time() - started:.0f} s so far)")
        emit(profile.breakdown(traced, args.quick))
        if not args.quick:
            from benchmarks import pooling  # defines Cells: imports MindSpore
            section("profile", "pooling rewrites", lambda: pooling.alternatives(batches, rounds // 2, calls))

    emit(f"total time {time.time() - started:.0f} s; load average at the end "
         f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    png = plot.plot(tables, memory_rows, os.path.join(args.out, "ratios.png"), report[0].splitlines()[0])
    with open(os.path.join(args.out, "report.txt"), "w", encoding="utf-8") as handle:
        handle.write("\n\n".join(report) + "\n")
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as handle:
        json.dump({"header": report[0], "quick": args.quick, "tables": [t.to_json() for t in tables],
                   "memory": memory_rows, "peak_memory": peak_rows,
                   "activation_memory": activation_rows}, handle, indent=1)
    print(f"wrote {args.out}/report.txt, results.json" + (f" and {os.path.basename(png)}" if png else ""),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
