"""Small helpers shared across myriad: optional imports, seeding, devices."""
