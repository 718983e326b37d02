"""Text handling before synthesis: cleaning, sentence splitting, normalization."""
