"""Where surge's processes run: `local` (this machine, the default) or `ray` (a cluster)."""
