"""modelyard.scale"""
