"""Analysis: turning patching results into rankings and explanations."""
