"""VLA domain config (registers `vla`)."""
