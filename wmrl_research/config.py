"""AutoResearch domain config (registers `research`)."""
