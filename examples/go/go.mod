module podlock.io/examples/go

go 1.22
