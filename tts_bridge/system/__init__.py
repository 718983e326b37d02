"""Process-level concerns every room uses: folders, durable writes, faults and degraded state,
connection caps, the machine and its thread plan."""
