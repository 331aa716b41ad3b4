"""modelyard.bench"""
