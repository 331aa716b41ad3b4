"""modelyard.backends"""
