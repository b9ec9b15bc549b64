"""A batch's steps, each under the batch lease and ending in one fenced transaction:
`validation` (`validating` → `in_progress` or `failed`) and `finalization` (→ `completed`,
`cancelled` or `expired`: cancel and expiry are endings of finalization). The API's
housekeeping and the workers both run them from here.

Beside them, what the steps share: `batch_lease`, `step_share` (fair share across projects),
`batch_end` (the one move to a terminal status), and the result chunks as the worker and the
finalizer both read them (`recorded`), lose them (`lost_objects`) and remove them
(`chunk_cleanup`).
"""
