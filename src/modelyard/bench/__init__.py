"""`modelyard bench`: load generator, workloads, report, plots (see docs/bench.md).

Modules: `workloads` (what to send), `client` (send one request and time it), `loadgen` (when to
send: closed loop, Poisson, bursts), `report` (percentiles, goodput, JSON/Markdown), `plots`,
`compare`, `cli`.
"""
