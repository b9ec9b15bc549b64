"""The command line of `overnight run-batch`; everything else passes through to vLLM."""

import argparse

VLLM_FORMAT = "vllm"
OPENAI_FORMAT = "openai"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--input-file", required=True, help="a path or an http(s) URL")
    parser.add_argument(
        "-o",
        "--output-file",
        required=True,
        help="a path (written in place: a FIFO or /dev/stdout work), or an http(s) URL to PUT to",
    )
    parser.add_argument(
        "--error-file",
        help="failed requests go here (path or URL) instead of into the output file",
    )
    parser.add_argument(
        "--output-format",
        choices=[VLLM_FORMAT, OPENAI_FORMAT],
        default=VLLM_FORMAT,
        help="error lines as vLLM's run_batch writes them (status in `response`, null body, "
        "the error in `error`; default) or as OpenAI's Batch API does (the error as the body)",
    )
    parser.add_argument(
        "--work-dir",
        help="database, store and checkpoints; rerun with the same one to resume "
        "(default: .overnight-run-batch/<hash of the input> in the current directory)",
    )
    parser.add_argument(
        "--keep-work-dir",
        action="store_true",
        help="keep the work directory after a successful run (it is always kept after a failure)",
    )
    parser.add_argument(
        "--model",
        help="what vLLM loads (a Hugging Face id, a folder, a bundled model's name such as "
        "SmolLM2-135M-Instruct); default: the input's first `model`",
    )


# `overnight worker`'s options that run-batch takes as the worker does: the LoRA adapters its
# engine serves, and vLLM's statistics. The others name a deployment (a data directory, a
# worker's name and health file, an online port, the models to switch between) or tune a
# long-running worker; run-batch has its own deployment in --work-dir.
RUN_BATCH_WORKER_OPTIONS = {"help", "model", "lora_dir", "lora_repo", "enable_log_stats"}


def worker_only_options(engine_argv: list[str]) -> list[str]:
    """The options among `engine_argv` that only `overnight worker` takes (given a value other
    than their default), as they are spelt on the command line."""
    from worker.cli import own_parser, split_model

    parser = own_parser()
    given, _vllm = parser.parse_known_args(split_model(engine_argv)[1])
    return [
        flag
        for action in parser._actions
        if action.dest not in RUN_BATCH_WORKER_OPTIONS
        and getattr(given, action.dest) != parser.get_default(action.dest)
        for flag in action.option_strings[:1]
    ]
