"""Reading and writing the model files of other systems (DiSMEC++ so far)."""
