"""Recipe transforms, each a small module with one ``apply`` function."""
