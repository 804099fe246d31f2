"""The `surge` command line."""
