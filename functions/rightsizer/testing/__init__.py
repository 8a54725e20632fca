"""Test and demo doubles that ship with the package (never imported by the Lambda handlers)."""
