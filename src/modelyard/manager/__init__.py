"""modelyard.manager"""
