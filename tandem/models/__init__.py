"""tandem.models"""
