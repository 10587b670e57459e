"""Test support shared by every test package: free ports, real servers on loopback."""
