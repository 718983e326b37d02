"""The running service: builds everything once, and one module per front end."""
