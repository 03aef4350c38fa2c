"""Builders: model specs (the zoo), export, validation and the Triton repository writer."""
