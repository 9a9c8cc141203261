"""The worker's own entry point: ``python -m worker [--gpus all|0,2|N] [--cpu N]``, and the
worker-side commands that need torch and diffusers.

``framefleet worker`` hands its process over to this (the producer's CLI never imports
``worker``): one pinned Celery worker per GPU and/or CPU workers, supervised until SIGTERM or
SIGINT (``worker.lifecycle.launcher``). ``framefleet models …`` hands over the same way to the
subcommands (``worker.commands``):

- ``python -m worker models tiny PATH [--layout t2v|ti2v|i2v]``: a tiny random Wan pipeline;
- ``python -m worker calibrate-magcache --model DIR --steps N``: a model's MagCache ratios;
- ``python -m worker compile --model DIR --tiers exact,fp8 --sizes HxWxF,…``: compile
  artifacts (``worker.generate.model.compiler``).

A configuration error is one ``error:`` line and exit status 1.
"""

from __future__ import annotations

import argparse
import sys

from producer.errors import FramefleetError
from producer.settings import get_settings

SUBCOMMANDS = ("models", "calibrate-magcache", "compile")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        from worker.commands import run_command

        if argv[0] == "compile":  # the compile cache folder before anything compiles
            from worker.lifecycle.warmup import use_compile_cache

            try:
                use_compile_cache(get_settings().compile_cache_dir)
            except FramefleetError as e:
                sys.stderr.write("error: " + " ".join(str(e).split()) + "\n")
                return 1

        return run_command(argv)
    parser = argparse.ArgumentParser(
        prog="framefleet worker",
        description="Start one pinned Celery worker per GPU (and/or CPU workers), supervised.")
    parser.add_argument("--gpus", default=None, help="all | 0,2 | N (the first N)")
    parser.add_argument("--cpu", type=int, default=0, help="CPU workers to start")
    args = parser.parse_args(argv)
    gpus = "all" if args.gpus is None and args.cpu == 0 else args.gpus
    try:
        from worker.lifecycle.launcher import launch

        return launch(gpus, args.cpu, get_settings())
    except (FramefleetError, ValueError) as e:
        sys.stderr.write("error: " + " ".join(str(e).split()) + "\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
