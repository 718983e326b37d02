"""Speech engines behind one small protocol (see base.Engine)."""
