"""The worker runtime: leases jobs, runs handlers in slices with heartbeats, records their outcomes."""
