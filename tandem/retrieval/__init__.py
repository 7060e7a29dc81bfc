"""tandem.retrieval"""
