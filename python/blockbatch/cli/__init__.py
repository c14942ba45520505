"""blockbatch: native decoding of diffusion language models (LLaDA, Dream, LLaDA2), BlockBatch included.

    blockbatch generate [--model DIR] [--policy P] PROMPT...   decode prompts (default: the shipped toy model)
    blockbatch bench [--policies dual blockbatch ...]   accuracy / NFE / time of policies side by side
    blockbatch serve [--model DIR] [--port 8000]   an OpenAI-compatible HTTP server (completions, chat, streaming)
    blockbatch tune [--tasks FILE]          sweep decode settings: the accuracy-NFE-time frontier, a preset
    blockbatch forward --model DIR          load a checkpoint, run one native forward, print logits stats
    blockbatch make-random DIR [--family dream] [--preset dream-7b]
                                            write a random checkpoint of a family (for trying things out)

Run ``blockbatch COMMAND --help`` for every option.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import bench, forward, generate, make_random, serve, tune
from .common import Parser, UsageError, one_line

# One module per subcommand, each with add_parser(sub) and run(args), in the order --help lists them.
COMMANDS = (generate, bench, serve, tune, forward, make_random)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="blockbatch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI. User errors (bad arguments, checkpoints, prompts, files) print one line
    ``error: ...`` on stderr and return 2; Ctrl-C prints ``interrupted`` and returns 130."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UsageError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, TypeError, OSError, ImportError) as e:
        # CheckpointError, DecodeOptions, TORCH_CHECK (RuntimeError / ValueError), files: one clear line
        if isinstance(e, BrokenPipeError):  # `blockbatch generate ... | head`: stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory", file=sys.stderr)
        return 2
