//! PDFs made by the tests, with lopdf: text pages, image-only pages,
//! encrypted, truncated, very long, and hostile files.

#![allow(dead_code)]

use lopdf::{
    Dictionary, Document, EncryptionState, EncryptionVersion, Object, ObjectId, Permissions,
    Stream,
    content::{Content, Operation},
    dictionary,
};
use std::io::Write;

/// A page to put in a generated document.
pub enum Page {
    /// Lines of text in Helvetica.
    Text(Vec<String>),
    /// A single grey image drawn over the page, no text.
    Image,
    /// Raw content bytes (and extra resources) for hostile cases.
    Raw(Vec<u8>),
}

/// Builds a document. `info` sets Title and Author.
pub struct Builder {
    doc: Document,
    pages_id: ObjectId,
    font_id: ObjectId,
    image_id: ObjectId,
    kids: Vec<Object>,
    extra_xobjects: Dictionary,
    media_box: bool,
}

impl Builder {
    pub fn new() -> Self {
        let mut doc = Document::with_version("1.5");
        let pages_id = doc.new_object_id();
        let font_id = doc.add_object(dictionary! {
            "Type" => "Font",
            "Subtype" => "Type1",
            "BaseFont" => "Helvetica",
            "Encoding" => "WinAnsiEncoding",
        });
        // A 4x4 grey image: enough for the page to draw something that is not text.
        let image = Stream::new(
            dictionary! {
                "Type" => "XObject",
                "Subtype" => "Image",
                "Width" => 4,
                "Height" => 4,
                "ColorSpace" => "DeviceGray",
                "BitsPerComponent" => 8,
            },
            vec![0x80; 16],
        );
        let image_id = doc.add_object(image);
        Self {
            doc,
            pages_id,
            font_id,
            image_id,
            kids: vec![],
            extra_xobjects: Dictionary::new(),
            media_box: true,
        }
    }

    /// Adds a form XObject named `name` whose content is `content` (for hostile cases).
    pub fn form(&mut self, name: &str, content: &[u8], self_ref: bool) -> ObjectId {
        let id = self.doc.new_object_id();
        let mut dict = dictionary! {
            "Type" => "XObject",
            "Subtype" => "Form",
            "BBox" => vec![0.into(), 0.into(), 100.into(), 100.into()],
        };
        if self_ref {
            // Its own resources name itself: `/Loop Do` inside draws the form again.
            dict.set(
                "Resources",
                dictionary! { "XObject" => dictionary! { name => id } },
            );
        }
        self.doc
            .objects
            .insert(id, Object::Stream(Stream::new(dict, content.to_vec())));
        self.extra_xobjects.set(name, id);
        id
    }

    /// Leaves MediaBox out of every page (a malformed file).
    pub fn without_media_box(mut self) -> Self {
        self.media_box = false;
        self
    }

    pub fn page(mut self, page: Page) -> Self {
        let content = match page {
            Page::Text(lines) => {
                let mut ops = vec![
                    Operation::new("BT", vec![]),
                    Operation::new("Tf", vec!["F1".into(), 12.into()]),
                    Operation::new("TL", vec![16.into()]),
                    Operation::new("Td", vec![72.into(), 760.into()]),
                ];
                for line in lines {
                    ops.push(Operation::new("Tj", vec![Object::string_literal(line)]));
                    ops.push(Operation::new("T*", vec![]));
                }
                ops.push(Operation::new("ET", vec![]));
                Content { operations: ops }
                    .encode()
                    .expect("encode content")
            }
            Page::Image => b"q 400 0 0 400 100 300 cm /Im1 Do Q\n".to_vec(),
            Page::Raw(bytes) => bytes,
        };
        let mut stream = Stream::new(Dictionary::new(), content);
        let _ = stream.compress();
        let content_id = self.doc.add_object(stream);
        let mut xobjects = dictionary! { "Im1" => self.image_id };
        for (k, v) in self.extra_xobjects.iter() {
            xobjects.set(k.clone(), v.clone());
        }
        let resources = dictionary! {
            "Font" => dictionary! { "F1" => self.font_id },
            "XObject" => xobjects,
        };
        let mut page = dictionary! {
            "Type" => "Page",
            "Parent" => self.pages_id,
            "Contents" => content_id,
            "Resources" => resources,
        };
        if self.media_box {
            page.set("MediaBox", vec![0.into(), 0.into(), 612.into(), 792.into()]);
        }
        let id = self.doc.add_object(page);
        self.kids.push(id.into());
        self
    }

    pub fn text_pages(mut self, pages: &[&[&str]]) -> Self {
        for p in pages {
            self = self.page(Page::Text(p.iter().map(|s| s.to_string()).collect()));
        }
        self
    }

    fn finish(mut self, title: &str, author: &str) -> Document {
        let count = self.kids.len() as i64;
        self.doc.objects.insert(
            self.pages_id,
            Object::Dictionary(
                dictionary! { "Type" => "Pages", "Kids" => self.kids, "Count" => count },
            ),
        );
        let catalog = self
            .doc
            .add_object(dictionary! { "Type" => "Catalog", "Pages" => self.pages_id });
        self.doc.trailer.set("Root", catalog);
        let info = self.doc.add_object(dictionary! {
            "Title" => Object::string_literal(title),
            "Author" => lopdf::text_string(author),
            "Producer" => Object::string_literal("omicos-pdf tests (lopdf)"),
        });
        self.doc.trailer.set("Info", info);
        self.doc
    }

    /// The bytes of the document.
    pub fn build(self, title: &str, author: &str) -> Vec<u8> {
        save(self.finish(title, author))
    }

    /// The bytes of the document encrypted (RC4 128) with `user_password`.
    pub fn build_encrypted(self, title: &str, user_password: &str) -> Vec<u8> {
        let mut doc = self.finish(title, "Someone");
        if doc.trailer.get(b"ID").is_err() {
            let id = Object::string_literal(b"0123456789abcdef".to_vec());
            doc.trailer.set("ID", vec![id.clone(), id]);
        }
        let state = EncryptionState::try_from(EncryptionVersion::V2 {
            document: &doc,
            owner_password: "owner-secret",
            user_password,
            key_length: 128,
            permissions: Permissions::all(),
        })
        .expect("encryption state");
        doc.encrypt(&state).expect("encrypt");
        save(doc)
    }
}

fn save(mut doc: Document) -> Vec<u8> {
    let mut out = Vec::new();
    doc.save_to(&mut out).expect("save pdf");
    out
}

/// The usual three-page paper of the tests.
pub fn paper() -> Vec<u8> {
    Builder::new()
        .text_pages(&[
            &[
                "Introduction",
                "Single-cell RNA sequencing measures expression per cell.",
            ],
            &[
                "Methods",
                "Cells were clustered with the Leiden algorithm.",
                "Leiden resolution was 0.8.",
            ],
            &[
                "Results",
                "Cluster 3 expressed CD14 and LYZ, marking monocytes.",
            ],
        ])
        .build("A Test Paper (draft)", "Ada Lovelace")
}

/// A document of `n` pages, page k saying `This is page k of the long report.`
pub fn long(n: usize) -> Vec<u8> {
    let mut b = Builder::new();
    for k in 1..=n {
        let mut lines = vec![format!("This is page {k} of the long report.")];
        if k == 250 {
            lines.push("The rare marker GZMK appears only here.".into());
        }
        b = b.page(Page::Text(lines));
    }
    b.build("Long report", "Report Writer")
}

/// Zlib-compressed `n` zero bytes: a tiny stream that inflates far.
pub fn deflated_zeros(n: usize) -> Vec<u8> {
    let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let chunk = vec![b' '; 1 << 16];
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len());
        enc.write_all(&chunk[..k]).unwrap();
        left -= k;
    }
    enc.finish().unwrap()
}

/// A page whose content stream is a zlib bomb of `n` bytes.
pub fn bomb(n: usize) -> Vec<u8> {
    let mut b = Builder::new().text_pages(&[&["A normal first page."]]);
    let content = deflated_zeros(n);
    let stream = Stream::new(dictionary! { "Filter" => "FlateDecode" }, content);
    let sid = b.doc.add_object(stream);
    b = b.page(Page::Raw(Vec::new()));
    // Point the last page's Contents at the bomb.
    let last = b.kids.last().and_then(|k| k.as_reference().ok()).unwrap();
    b.doc
        .get_object_mut(last)
        .unwrap()
        .as_dict_mut()
        .unwrap()
        .set("Contents", sid);
    b.build("Bomb", "Nobody")
}

/// A text page whose font embeds a program that is a zlib bomb of `n` bytes.
pub fn font_bomb(n: usize) -> Vec<u8> {
    let mut b = Builder::new().text_pages(&[&["Text in a bombed font."]]);
    let program = Stream::new(dictionary! { "Filter" => "FlateDecode" }, deflated_zeros(n));
    let program_id = b.doc.add_object(program);
    let descriptor = b.doc.add_object(dictionary! {
        "Type" => "FontDescriptor",
        "FontName" => "Helvetica",
        "Flags" => 32,
        "FontFile2" => program_id,
    });
    let font_id = b.font_id;
    b.doc
        .get_object_mut(font_id)
        .unwrap()
        .as_dict_mut()
        .unwrap()
        .set("FontDescriptor", descriptor);
    b.build("Font bomb", "Nobody")
}
