"""The batch core: the concepts the API and the workers share, with no I/O of their own.

`states` (batch and shard statuses, finalization endings, shard outcomes), `progress`
(request counts and token sums), `chunks` (the result-chunk format) and `leases` (what a
lease holder holds). It imports nothing else of the project.
"""
