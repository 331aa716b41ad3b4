"""modelyard.api"""
