"""What a model is: the spec record, spec files (models.toml), user models, the zoo, images as inputs."""
