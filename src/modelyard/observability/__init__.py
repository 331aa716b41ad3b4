"""modelyard.observability"""
