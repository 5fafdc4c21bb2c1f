"""The pipeline matrix: every diffusers video pipeline class, classified
(``entries.py`` says how). Entries live in one module per group of pipelines."""
