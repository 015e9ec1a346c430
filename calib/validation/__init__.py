"""The parts of `calib validate` (calib/validate.py is the job): measured figures, replay, the calls
into fit/project, thresholds, report records and writers."""
