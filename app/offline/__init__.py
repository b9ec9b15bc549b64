"""`overnight run-batch`: one batch file through the worker pipeline, with no server.

A drop-in for vLLM's `run_batch` (`-i/--input-file`, `-o/--output-file`, any engine
argument, vLLM's per-line errors and line shapes), run as a private deployment in a work
directory: a SQLite database and a store. The input is stored, validated, sharded, run and
finalized as the service does, and checkpointed there: rerun the same command after a crash
and it resumes where the results stop.

The command line is `app.offline.arguments`, the run `app.offline.runner`: `--help` imports
only the first.
"""
