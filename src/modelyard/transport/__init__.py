"""modelyard.transport"""
