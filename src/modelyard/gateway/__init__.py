"""modelyard.gateway"""
