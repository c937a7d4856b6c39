package v1

// Hub marks v1 as the version the others convert to and from.
func (*Website) Hub() {}
