"""The Python backend's stubs: the model.py files the builders copy into repositories, and what only they import."""
