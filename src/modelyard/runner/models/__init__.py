"""modelyard.runner.models"""
