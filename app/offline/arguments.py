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
