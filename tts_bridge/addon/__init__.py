"""Running as a Home Assistant add-on: the Supervisor's API, the add-on options, the entry point.

Nothing here runs outside an add-on container unless asked: ``start`` falls back to the plain
container's behaviour when no Supervisor token is set.
"""
