"""Audio as bytes: PCM helpers and encoders, the formats speakers play, streamed encoders."""
