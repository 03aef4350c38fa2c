"""what requests carry: text lengths and texts, the ragged closed-loop client."""
