"""The work directory's memory between runs of the same command."""

from pathlib import Path

from pydantic import BaseModel

from app.offline.errors import OfflineError

STATE_FILE = "run-batch.json"


class State(BaseModel):
    input: str
    file_id: str
    batch_id: str


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


def save_state(work_dir: Path, state: State) -> None:
    (work_dir / STATE_FILE).write_text(state.model_dump_json())
