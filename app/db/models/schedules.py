"""A batch's scheduling state, apart from the batch: its fair-share clock, the planner's
verdict and its ETAs (`app.services.schedule`, `worker/claim.py`).

Its own row so that the writers of the schedule never write the `batches` row: a checkpoint
moves this row's clock (and its project's share), the planner rewrites its estimates, and the
`batches` row is left to the API's object and the batch-level steps' lease.
"""

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models.base import Base


class BatchSchedule(Base):
    """One per batch from its admission on (`app.services.schedule.admit`)."""

    __tablename__ = "batch_schedules"

    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id"), primary_key=True)
    # Work served (output tokens, or input tokens, or requests: `app.core.schedule.work_of`)
    # and the batch's fair-share clock inside its project.
    work_done: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    vtime: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # `batches.expires_at` while the planner finds the batch at risk under fair share (it then
    # goes first, earliest deadline first).
    urgent_deadline: Mapped[int | None] = mapped_column(BigInteger)
    expected_miss: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    eta_start_at: Mapped[float | None] = mapped_column(Float)
    eta_finish_at: Mapped[float | None] = mapped_column(Float)
    eta_made_at: Mapped[float | None] = mapped_column(Float)
