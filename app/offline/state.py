"""The work directory's memory between runs of the same command."""

import os
from pathlib import Path

from pydantic import BaseModel

from app.offline.errors import OfflineError
from app.offline.source import is_url

STATE_FILE = "run-batch.json"


class State(BaseModel):
    input: str
    file_id: str
    batch_id: str
    # What the run was of: a rerun resumes it only for the same input file (size and
    # modification time) and the same --model. None: recorded before these were kept.
    input_version: str | None = None
    model: str | None = None


def input_version(source: str) -> str:
    """A local file's size and modification time; a URL's content is not known ahead."""
    if is_url(source):
        return "url"
    try:
        stat = os.stat(source)
    except OSError:
        return "unreadable"
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def load_state(work_dir: Path, source: str) -> State | None:
    """The recorded run of `source` here, None if none was recorded."""
    path = work_dir / STATE_FILE
    if not path.exists():
        return None
    state = State.model_validate_json(path.read_bytes())
    if state.input != source:
        raise OfflineError(
            f"{work_dir} holds the run of {state.input}, not {source}: use another --work-dir"
        )
    return state


def is_same_run(state: State, source: str, model: str | None) -> bool:
    """Whether a rerun asks for the recorded run: else its results belong to another one
    (an edited input, say, after its errors were reported) and it starts over."""
    if state.input_version is None:
        return True
    return state.input_version == input_version(source) and state.model == model


def save_state(work_dir: Path, state: State) -> None:
    (work_dir / STATE_FILE).write_text(state.model_dump_json())
