"""Training for accuracy: one recipe for every mixer, the data sets, and the generated Pathfinder task.
May import models and mixers; must not import measure, sweep or report.
"""
