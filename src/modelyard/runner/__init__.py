"""modelyard.runner"""
