"""The ground floor that `sweeps` (running a study) and `reports` (reading it) both stand on:
the names a study's records are stored under (attrs), what a trial's runs say of where training
breaks (runs), the two models both read a study with: the GP surrogate of the loss (gp) and the
logistic posterior of the stability boundary (boundary), and where the machine's cache is
(cache). Imports neither package; never imports torch."""
