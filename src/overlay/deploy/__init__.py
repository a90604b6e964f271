"""From wheel to fleet: every pinned artifact built, ordered versions, a static index with hashes, and install /
revert / status of an engine in an existing Python environment (docs/deploy.md)."""
