"""modelyard.api.routes"""
