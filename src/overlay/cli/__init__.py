"""The command line: a thin layer that turns arguments into one core call and prints the result."""
