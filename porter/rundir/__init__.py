"""A run's directory: its lock and atomic writes, stage outputs, denoising checkpoints,
the run record, what a finished run writes and the video itself."""
