"""What the answers are worth: the count witness and the count-guided repairs."""
