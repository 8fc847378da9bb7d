"""Jobs and their leases: fetch, fenced writes, finishes, steps, resolutions, the operator's reads and filters."""
