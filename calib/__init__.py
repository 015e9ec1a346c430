"""calib: measure small LLM trainings, calibrate a training simulator, project to scale with a measured error."""

__version__ = "0.1.0"
